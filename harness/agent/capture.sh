#!/bin/sh
# Writes the work tree's changes against the base commit as a binary-safe diff.
# Usage: capture.sh REPO BASE OUT MAX_BYTES
#
# The diff is read with a scratch git directory that borrows the repository's objects: the
# agent may have rewritten the repository's .git (configuration, hooks, filters, excludes,
# its index or HEAD), and none of that takes part. Files git would track are compared with the
# base commit's tree; ignored files (by the work tree's .gitignore files) and .git are left out.
set -eu
repo=$1 base=$2 out=$3 max=$4
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_CEILING_DIRECTORIES=/ \
	GIT_OPTIONAL_LOCKS=0 GIT_TERMINAL_PROMPT=0 GIT_ATTR_NOSYSTEM=1 HOME=/tmp XDG_CONFIG_HOME=/tmp/none
scratch=/tmp/infradev-capture
git init -q "$scratch"
if [ ! -d "$repo/.git/objects" ]; then
	echo "the repository's .git/objects is gone: the base commit cannot be read" >&2
	exit 3
fi
echo "$repo/.git/objects" > "$scratch/.git/objects/info/alternates"
export GIT_DIR="$scratch/.git" GIT_WORK_TREE="$repo" GIT_INDEX_FILE=/tmp/infradev-capture.index
git read-tree "$base"
git add -A
git diff --cached --binary --full-index --no-renames --no-color --no-ext-diff --no-textconv \
	--src-prefix=a/ --dst-prefix=b/ "$base" > /tmp/infradev-capture.diff
head -c "$((max + 1))" /tmp/infradev-capture.diff > "$out"
