"""The certificate for a person: Markdown, the reasons for its level first, the identity
probes before anything built on them, then the causes (largest first), the cells, and the
difference from the reference backend."""

from __future__ import annotations

from typing import Any

from ..report.mdtext import escape as md


def markdown(cert: dict[str, Any]) -> str:
    """The certificate as a Markdown page."""
    out = [f"# Certificate: {md(cert['backend'])} (torch {md(cert['torch'])})", "",
           f"**Level: {cert['level']}**" + (" (conforming > declared > none)"), ""]
    if cert["why"]:
        out += ["Why not higher:", ""] + [f"- {md(w)}" for w in cert["why"]] + [""]
    ident = cert["identity"]
    out += ["## Identity", ""]
    if ident["ok"]:
        out += ["rank(), size() and the backend's name agree with the launch on every rank; "
                "a barrier, a one-element all_reduce and a subgroup work.", ""]
    else:
        out += ["**The backend's identity is wrong: the results below rest on it.**", ""]
        out += [f"- {md(p)}" for p in ident["problems"]] + [""]
    if cert.get("manifest_proposed"):
        out += ["The manifest was proposed by probes, not declared by the backend: review "
                "it and pass it with `--manifest` to certify.", ""]
    st = cert["statuses"]
    out += ["## Summary", "", f"{cert['instances']} instances: "
            + ", ".join(f"{n} {s}" for s, n in st.items() if n) + ".",
            f"Skipped for other reasons, or never started: {cert['skipped']} (budget "
            f"{cert['skip_budget']:.1%} of the instances).", "",
            f"Library session: {md(cert['headline'])}", ""]
    if cert["causes"]:
        out += ["## Causes of the failures, largest first", "",
                *_groups_table("cause", cert["causes"]), ""]
    if cert.get("pools_replaced"):
        out += ["## Process groups not kept after an instance, largest first", "",
                "Each started a new group for the next instance; a health check that failed "
                "after a rank raised means the backend's group was unusable after that error.",
                "", *_groups_table("why", cert["pools_replaced"]), ""]
    ref = cert.get("reference")
    if ref is not None:
        out += [f"## Difference from the reference ({md(str(ref['backend']))})", ""]
        if ref["backend"] and (cert.get("manifest") or {}).get("inherits") == ref["backend"]:
            out += [f"This backend inherits {md(str(ref['backend']))}: a cell where it shows an "
                    "inherited divergence and the reference its own divergence is the same "
                    "behaviour, not a difference.", ""]
        if ref["differs"]:
            out += ["| op | dtype | capability | this backend | reference |",
                    "|---|---|---|---|---|"]
            out += [f"| {md(d['op'])} | {md(d['dtype'])} | {md(d['capability'])} | "
                    f"{d['backend']} | {d['reference']} |" for d in ref["differs"]]
        else:
            out.append("Every cell both ran has the same status.")
        out.append("")
    out += ["## Cells (op x dtype x capability)", "",
            "| op | dtype | capability | status | records | example |",
            "|---|---|---|---|---|---|"]
    out += [f"| {md(c['op'])} | {md(c['dtype'])} | {md(c['capability'])} | {c['status']} | "
            + ", ".join(f"{n} {s}" for s, n in sorted(c["counts"].items())) + " | "
            f"{md(c['example'])} |" for c in cert["cells"]]
    return "\n".join(out) + "\n"


def _groups_table(label: str, groups: list[dict[str, Any]]) -> list[str]:
    """The lines of a table of grouped records (cells.causes, cells.replacements)."""
    return [f"| count | {label} | examples |", "|---:|---|---|",
            *(f"| {g['count']} | {md(g[label])} | " + "<br>".join(md(e) for e in g["examples"])
              + " |" for g in groups)]


def summary_line(cert: dict[str, Any]) -> str:
    """One line for the terminal."""
    why = f": {cert['why'][0][:200]}" if cert["why"] else ""
    return (f"collective-certify: {cert['backend']}: level {cert['level']}{why} "
            f"({len(cert['cells'])} cells, {cert['instances']} instances)")
