#!/bin/sh
# Reads its prompt, applies the patch kept for this task, leaves a log of its own.
set -eu
test -s "$INFRADEV_PROMPT"
git apply "/opt/agent/patches/$INFRADEV_TASK_ID.patch"
echo "{\"task\": \"$INFRADEV_TASK_ID\", \"applied\": true}" > "$INFRADEV_AGENT_LOGS/result.json"
