#!/usr/bin/env bash
# Debian packages the container-image tests of the local backend need (#24):
# skopeo (pulls; also exports the test image from the engine for the contract suite),
# docker-registry (the CNCF distribution server the tests push to on 127.0.0.1),
# squashfs-tools-ng (tar2sqfs, rdsquashfs) and squashfuse (each layer one file, mounted with FUSE, #34),
# apache2-utils (htpasswd, for the registry with basic auth). podman and bubblewrap come
# with the engine and the local backend; util-linux (unshare, mount) is essential.
set -euo pipefail
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  skopeo docker-registry apache2-utils squashfs-tools-ng squashfuse
