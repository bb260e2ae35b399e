#!/bin/sh
# Looks everywhere it can read for the task's hidden files, then tries the host's network
# (the port in /opt/agent/port on 127.0.0.1, where a test listens on the host).
found=$(find / \( -path /proc -o -path /sys \) -prune -o \( -name probes.yaml -o -name 'test_probes.py' \
	-o -name 'test_budget.py' -o -name samples.yaml -o -name gold.patch -o -name tests.patch \
	-o -name validation.json \) -print 2>/dev/null | sort)
{
	echo "hidden files: ${found:-none}"
	ls -A /run/infradev 2>/dev/null | sed 's/^/run: /'
	if python3 -c "import socket; socket.create_connection(('127.0.0.1', int(open('/opt/agent/port').read())), timeout=3)" 2>/dev/null; then
		echo "network: reached"
	else
		echo "network: unreachable"
	fi
} > FOUND.txt
