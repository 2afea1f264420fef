"""The runtime files of a ``local`` image sandbox, as written on the host
(``sandlot/sandboxes/local/runtime_files.py``); what a command sees of them is in
``tests/images/test_image_runtime_files.py``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandlot.images import ImageRoot
from sandlot.images.root import ImageConfig
from sandlot.sandboxes.local.hostdirs import HostDirs
from sandlot.sandboxes.local.jail import JailConfig, jail_argv
from sandlot.sandboxes.local.runtime_files import (
    RuntimeFilesError,
    etc_mode,
    hosts_file,
    resolv_conf,
    sandbox_hostname,
    write_runtime_files,
)

DOCKER_HOSTS = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\n"
    "ff02::1\tip6-allnodes\n"
    "ff02::2\tip6-allrouters\n"
)
"""What Docker writes before its own records (moby ``libnetwork/etchosts``, ``defaultContent``)."""


def test_the_hosts_file_is_dockers_with_the_hostname_on_loopback() -> None:
    assert hosts_file("0123456789ab", ipv6=True).decode() == (
        DOCKER_HOSTS + "127.0.0.1\t0123456789ab\n"
    )
    # Without ::1 on the loopback, no IPv6 record: a server told "localhost" would bind ::1.
    assert hosts_file("h", ipv6=False).decode() == "127.0.0.1\tlocalhost\n127.0.0.1\th\n"


def test_the_hostname_is_the_sandbox_ids_hex_as_dockers_short_id() -> None:
    assert sandbox_hostname("sandlot-0123456789ab") == "0123456789ab"


def test_resolv_conf_is_the_hosts_with_the_network_and_empty_without(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_text("nameserver 127.0.0.53\nsearch example\n")  # kept: the host's namespace
    assert resolv_conf(True, str(host)) == host.read_bytes()
    assert resolv_conf(False, str(host)) == b""
    assert resolv_conf(True, str(tmp_path / "none")) == b""


def test_the_files_are_written_into_the_writable_layer(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    upper.mkdir()
    write_runtime_files(upper, "abc", network=False, mode=0o751)
    etc = upper / "etc"
    assert stat.S_IMODE(etc.stat().st_mode) == 0o751
    assert (etc / "hostname").read_text() == "abc\n"
    assert (etc / "hosts").read_text().endswith("127.0.0.1\tabc\n")
    assert (etc / "resolv.conf").read_bytes() == b""
    assert {stat.S_IMODE((etc / n).stat().st_mode) for n in ("hosts", "hostname")} == {0o644}
    write_runtime_files(upper, "abc", network=True)  # a restart with the network
    assert (etc / "resolv.conf").read_bytes() == resolv_conf(True)
    assert sorted(os.listdir(etc)) == ["hostname", "hosts", "resolv.conf"]


def test_links_a_command_left_in_the_layer_are_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("host file")
    upper = tmp_path / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "hosts").symlink_to(victim)
    write_runtime_files(upper, "abc", network=False)
    assert victim.read_text() == "host file"
    assert not (upper / "etc" / "hosts").is_symlink()
    # /etc itself made a link to a host directory: refused, nothing written there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "etc").symlink_to(elsewhere)
    with pytest.raises(RuntimeFilesError, match="not a directory"):
        write_runtime_files(other, "abc", network=False)
    assert os.listdir(elsewhere) == []


def test_etc_mode_is_the_images_and_none_for_a_link(tmp_path: Path) -> None:
    top, base = tmp_path / "top", tmp_path / "base"
    (base / "etc").mkdir(parents=True)
    (base / "etc").chmod(0o750)
    top.mkdir()
    image = ImageRoot("x", "sha256:0", (top, base), ImageConfig())
    assert etc_mode(image) == 0o750
    (top / "private" / "etc").mkdir(parents=True)
    (top / "etc").symlink_to("private/etc")
    assert etc_mode(image) is None
    assert etc_mode(ImageRoot("x", "sha256:0", (tmp_path / "empty",), ImageConfig())) == 0o755


def test_an_image_jail_sets_its_hostname(tmp_path: Path) -> None:
    dirs = HostDirs(tmp_path / "sandbox")
    dirs.root.mkdir()
    config = JailConfig(bwrap="/bin/true", rootfs=dirs.root / "rootfs", workdir="/testbed",
                        network=False, layers=(tmp_path / "layer",), hostname="abc")  # fmt: skip
    argv = jail_argv(config, dirs)
    assert argv[argv.index("--hostname") + 1] == "abc" and "--unshare-uts" in argv
