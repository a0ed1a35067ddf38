#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs what artfs needs, builds and installs it, and mounts it with its
# defaults on /mnt/artifacts (store /dev/shm/artfs, capacity 8G). For Debian
# 12, as root. allow_other lets engines and trainers of any user reach it.
set -eu
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2046
apt-get install -y -qq --no-install-recommends $(cat contrib/debian-packages) >/dev/null
autoreconf -fi
./configure
make -j"$(nproc)"
make install
ldconfig
mkdir -p /mnt/artifacts
if grep -q " /mnt/artifacts fuse.artfs " /proc/mounts; then
	echo "artfs is already mounted on /mnt/artifacts"
else
	artfs -o allow_other /mnt/artifacts
fi
grep " /mnt/artifacts " /proc/mounts
cat /mnt/artifacts/.artfs/config
