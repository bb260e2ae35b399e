#!/usr/bin/env bash
# Runs one submission on one task: `infradev run-task`, nothing else. Exit 0: resolved.
# INFRADEV_RESULTS (--test_env) names a results store shared with `infradev eval`.
set -euo pipefail
# The task and its probes, exactly their declared files: the runfiles tree also holds this
# script, which must not count as task input (results are keyed by the inputs' digests).
stage() { # stage DIR DEST FILE...: copy FILEs (relative to DIR), following links
  local dir=$1 dest=$2
  shift 2
  for f in "$@"; do
    mkdir -p "$dest/$(dirname "$f")"
    cp -L "$dir/$f" "$dest/$f"
  done
}
stage "%TASK%" "$TEST_TMPDIR/task" %TASK_FILES%
stage "%PROBES%" "$TEST_TMPDIR/probes" %PROBE_FILES%
%STAGE_ENVIRONMENTS%
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}/run"
exec "%INFRADEV%" --cache "${INFRADEV_CACHE:-$TEST_TMPDIR/cache}" %STORE% run-task \
  --task "$TEST_TMPDIR/task" --probes "$TEST_TMPDIR/probes" %IMAGE% \
  --patch "%PATCH%" --submission-digest "$(cat "%DIGEST%")" --out "$out" --model "${INFRADEV_MODEL:-bazel}" \
  --results "${INFRADEV_RESULTS:-}"
