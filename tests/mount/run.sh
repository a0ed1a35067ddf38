#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs the real-mount tests against one daemon build: run.sh <daemon>.
# Exit 77 (skip) only where no FUSE mount can be made at all; a missing
# test tool is a hard error so that CI cannot pass without running them.
daemon="$1"
here=$(dirname "$0")
PYTHON=${PYTHON:-/usr/bin/python3}

if [ ! -c /dev/fuse ]; then
	echo "SKIP: /dev/fuse is missing, no FUSE mount possible here"
	exit 77
fi
if [ "$(id -u)" != 0 ]; then
	echo "SKIP: the mount tests mount and unmount as root"
	exit 77
fi
for tool in getfattr setfattr stat cp cat df; do
	command -v "$tool" >/dev/null || { echo "ERROR: $tool is missing (tests/install-and-check.sh installs it)"; exit 99; }
done
if ! "$PYTHON" -c "import numpy, pytest" 2>/dev/null; then
	echo "ERROR: $PYTHON lacks numpy or pytest (python3-numpy, python3-pytest)"
	exit 99
fi
[ -x "$daemon" ] || { echo "ERROR: no daemon at $daemon"; exit 99; }

ARTFS_DAEMON="$daemon"
export ARTFS_DAEMON
exec "$PYTHON" -m pytest -q -p no:cacheprovider -o console_output_style=classic --durations=20 \
	--rootdir "$here" "$here"
