#!/usr/bin/env bash
# Replace the case files of this (base-branch) checkout with those of an untrusted pull
# request, taking nothing else from it: no harness code, no CI script, no conftest.py, no
# pytest.ini, no baseline. Only regular files matching cases/**/*.yaml (or .yml) are copied;
# symlinks and everything outside cases/ are ignored. See docs/howto/ci-gate.md.
# Usage: bash ci/pr-cases.sh REPOSITORY_URL COMMIT_SHA
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$1"
sha="$2"
if ! [[ "$sha" =~ ^[0-9a-f]{40}$ ]]; then
  echo "::error::not a commit sha: $sha"
  exit 2
fi
git fetch --no-tags --depth=1 "$repo" "$sha"
# The base branch's cases go: a case the pull request deletes or renames must not linger.
find cases -type f \( -name '*.yaml' -o -name '*.yml' \) -delete
count=0
while IFS= read -r -d '' entry; do
  meta="${entry%%$'\t'*}"
  path="${entry#*$'\t'}"
  read -r mode type blob <<<"$meta"
  case "$path" in
    cases/*.yaml|cases/*.yml) ;;
    *) continue ;;
  esac
  if [ "$type" != blob ] || { [ "$mode" != 100644 ] && [ "$mode" != 100755 ]; }; then
    echo "::warning::skipping $path: not a regular file (mode $mode)"
    continue
  fi
  mkdir -p "$(dirname "$path")"
  git cat-file blob "$blob" > "$path"
  count=$((count + 1))
done < <(git ls-tree -r -z "$sha" -- cases)
echo "took $count case file(s) from $sha; everything else is the base branch's"
