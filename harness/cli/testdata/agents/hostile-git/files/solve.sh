#!/bin/sh
set -eu
git apply "/opt/agent/patches/$INFRADEV_TASK_ID.patch"
git -c user.name=agent -c user.email=agent@example.invalid commit -qam "the fix"
echo "kept out of git's sight" > hidden.txt
echo hidden.txt >> .git/info/exclude
printf '* filter=lie\n' > .git/info/attributes
git config filter.lie.clean 'echo FILTERED'
git config diff.noprefix true
git config core.hooksPath /nonexistent
