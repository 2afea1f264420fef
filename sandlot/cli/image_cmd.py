"""``sandlot image``: pull, list and prune the local backend's container image cache."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from sandlot.cli.gc_cmd import parse_duration
from sandlot.errors import SandboxError
from sandlot.images import is_image_reference, pull
from sandlot.images.progress import PullObserver, human_size
from sandlot.images.pulling import PullResult
from sandlot.images.squash import mounting
from sandlot.images.store import ImageStore
from sandlot.settings import settings

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"200G"``, ``"512M"``, ``"1.5T"``, ``"4096"`` (bytes; binary units) → bytes.

    Raises:
        click.BadParameter: not a size.
    """
    match = _SIZE.match(text.lower())
    if not match:
        raise click.BadParameter(f"{text!r} is not a size like 512M, 200G, 1.5T")
    return int(float(match[1]) * _SIZE_UNITS[match[2]])


@click.group("image")
def image_group() -> None:
    """The local backend's image cache (see docs/images.md)."""


def dataset_images(dataset: Path, backend: str) -> list[str]:
    """The distinct container images the instances of ``dataset`` name for ``backend``."""
    from sandlot.datasets.loaders import iter_instances

    names = dict.fromkeys(inst.image_for(backend) for inst in iter_instances(dataset))
    return [name for name in names if is_image_reference(name)]


@image_group.command("pull")
@click.argument("refs", nargs=-1)
@click.option("--dataset", type=click.Path(exists=True, path_type=Path),
              help="Also pull every image the instances of this dataset name.")  # fmt: skip
@click.option("--backend-images", default="local", show_default=True,
              help="Whose image names a --dataset row gives (its image map's key).")  # fmt: skip
@click.option("-j", "--jobs", default=4, show_default=True, help="Images pulled at once.")
@click.option("--force", is_flag=True, help="Re-resolve names already cached (as docker pull).")
@click.option("--fetch-only", is_flag=True,
              help="Fetch blobs only; an image's first sandbox unpacks it.")  # fmt: skip
@click.option("--ray", "on_ray", is_flag=True, help="Pull on every node of the Ray cluster.")
@click.option("--ray-address", default="auto", show_default=True, help="The cluster to join.")
def pull_command(
    refs: tuple[str, ...],
    dataset: Path | None,
    backend_images: str,
    jobs: int,
    force: bool,
    fetch_only: bool,
    on_ray: bool,
    ray_address: str,
) -> None:
    """Pull REFS (and a dataset's images) into the cache, in parallel, with a summary; with
    --ray, into the cache of every node of the cluster (one task per node). Layers are
    unpacked too (ready to run), unless --fetch-only."""
    names = list(
        dict.fromkeys([*refs, *(dataset_images(dataset, backend_images) if dataset else [])])
    )
    if not names:
        raise click.UsageError("nothing to pull: give image references or --dataset")
    if on_ray:
        _pull_on_ray(names, jobs, ray_address, unpack=not fetch_only)
        return
    console = Console(stderr=True)
    store = ImageStore()
    results: dict[str, PullResult | str] = {}
    started = time.monotonic()
    # On a terminal a live line per image (bytes, layers); elsewhere the one line per image
    # printed below.
    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        DownloadColumn(),
        TextColumn("{task.fields[layers]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    observer: PullObserver = _BarObserver(bars) if console.is_terminal else _Silent()
    with bars, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {
            pool.submit(
                pull, name, store, force=force, unpack=not fetch_only, observer=observer
            ): name
            for name in names
        }
        for future in as_completed(futures):
            name = futures[future]
            try:
                result = future.result()
            except SandboxError as exc:
                results[name] = str(exc)
                console.print(f"[{len(results)}/{len(names)}] {name}: [red]failed[/]: {exc}")
                continue
            results[name] = result
            what = "cached" if result.cached else f"{human_size(result.transferred)} transferred"
            if result.layers_unpacked:
                what += f", {result.layers_unpacked} layers unpacked"
            console.print(f"[{len(results)}/{len(names)}] {name}: {what} in {result.seconds:.1f} s")
    table = Table("image", "status", "transferred", "layers", "unpacked", "seconds")
    for name in names:
        outcome = results[name]
        if isinstance(outcome, str):
            table.add_row(name, "[red]failed[/]", "", "", "", "")
        else:
            status = "cached" if outcome.cached else "pulled"
            table.add_row(name, status, human_size(outcome.transferred),
                          str(outcome.layers_transferred), str(outcome.layers_unpacked),
                          f"{outcome.seconds:.1f}")  # fmt: skip
    _print_table(table)
    done = [r for r in results.values() if not isinstance(r, str)]
    failed = len(results) - len(done)
    click.echo(
        f"{len(done)}/{len(names)} images {'fetched' if fetch_only else 'ready'}, "
        f"{human_size(sum(r.transferred for r in done))} "
        f"transferred in {time.monotonic() - started:.1f} s"
        + (f", {failed} failed" if failed else "")
    )
    if failed:
        raise SystemExit(1)


class _BarObserver:
    """A rich progress line per image being fetched: bytes so far, layers in the cache."""

    def __init__(self, bars: Progress) -> None:
        self._bars = bars
        self._tasks: dict[str, TaskID] = {}

    def started(self, image: str) -> None:
        self._tasks[image] = self._bars.add_task(image, total=None, layers="")

    def advanced(self, image: str, transferred: int, layers_done: int, layers: int) -> None:
        task = self._tasks.get(image)
        if task is not None:
            self._bars.update(task, completed=transferred, layers=f"{layers_done}/{layers} layers")

    def finished(self, image: str, transferred: int, seconds: float) -> None:
        task = self._tasks.pop(image, None)
        if task is not None:
            self._bars.remove_task(task)


class _Silent:
    """No progress lines: the command prints one line per image itself."""

    def started(self, image: str) -> None:
        pass

    def advanced(self, image: str, transferred: int, layers_done: int, layers: int) -> None:
        pass

    def finished(self, image: str, transferred: int, seconds: float) -> None:
        pass


def _pull_on_ray(names: list[str], jobs: int, address: str, unpack: bool) -> None:
    from sandlot.images.prefetch import prefetch_on_cluster

    results = prefetch_on_cluster(names, jobs, address, unpack)
    table = Table("node", "ready", "failed", "transferred", "seconds")
    for node in results:
        table.add_row(node.node, str(node.ready), str(len(node.failed)),
                      human_size(node.transferred), f"{node.seconds:.1f}")  # fmt: skip
    _print_table(table)
    for node in results:
        for name, error in node.failed:
            click.echo(f"{node.node}: {name}: {error}", err=True)
    click.echo(f"{len(names)} images on {len(results)} nodes")
    if any(node.failed for node in results):
        raise SystemExit(1)


@image_group.command("prepull")
@click.option("--dataset", type=click.Path(exists=True, path_type=Path), required=True,
              help="Pre-pull every image the instances of this dataset name.")  # fmt: skip
@click.option("--backend", default="kubernetes", show_default=True,
              type=click.Choice(["kubernetes"]), help="The cluster kind.")  # fmt: skip
@click.option("--apply", "apply_", is_flag=True,
              help="Create them (replacing same-named ones); else print them.")  # fmt: skip
@click.option("--namespace", default=None, help="Default: the kubeconfig context's.")
@click.option("--kubeconfig", default=None, help="Default: $KUBECONFIG, ~/.kube/config.")
@click.option("--context", default=None, help="The kubeconfig context (default: current).")
@click.option("--node-selector", "node_selector", multiple=True, metavar="KEY=VALUE",
              help="Only nodes with this label: the sandboxes' pool (repeat).")  # fmt: skip
def prepull_command(
    dataset: Path,
    backend: str,
    apply_: bool,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    node_selector: tuple[str, ...],
) -> None:
    """A DaemonSet pulling every image of DATASET on every node (as DeepSWE does): printed as
    YAML, or created with --apply (docs/kubernetes.md)."""
    import anyio
    import yaml

    from sandlot.sandboxes.kubernetes import KubernetesOptions
    from sandlot.sandboxes.kubernetes.prepull import apply_daemonsets, prepull_daemonsets

    images = dataset_images(dataset, backend)
    if not images:
        raise click.UsageError(f"{dataset} names no container image for backend {backend}")
    bad = [item for item in node_selector if "=" not in item]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not KEY=VALUE", param_hint="--node-selector")
    options = KubernetesOptions(
        namespace=namespace,
        kubeconfig=kubeconfig,
        context=context,
        node_selector=dict(item.split("=", 1) for item in node_selector),
    )
    sets = prepull_daemonsets(images, options)
    if not apply_:
        click.echo(yaml.safe_dump_all(sets, sort_keys=False), nl=False)
        return
    try:
        where = anyio.run(apply_daemonsets, sets, options)
    except SandboxError as exc:
        raise click.ClickException(str(exc)) from exc
    names = ", ".join(s["metadata"]["name"] for s in sets)
    click.echo(f"applied {names} in namespace {where}: {len(images)} images on every node")


@image_group.command("list")
def list_command() -> None:
    """Cached images: fetched or unpacked, size, bytes shared with other images, last use."""
    store = ImageStore()
    mounted = mounting()
    table = Table("image", "manifest", "state", "size", "shared", "last used")
    now = time.time()
    for info in store.entries():
        ago = max(0, int(now - info.last_used))
        used = f"{ago // 3600}h{ago % 3600 // 60:02d}m ago"
        names = ", ".join(info.references)
        state = ("mountable" if mounted else "unpacked") if info.unpacked else "fetched"
        table.add_row(
            names, info.manifest[7:19], state, human_size(info.size), human_size(info.shared), used
        )
    _print_table(table)
    click.echo(f"cache: {store.root}")
    click.echo(f"layers: {layers_mode()}")


@image_group.command("prune")
@click.option("--older-than", help="Remove images unused for this long (90m, 12h, 7d).")
@click.option(
    "--keep-size", help="Then remove the least recently used until the cache is this big (200G)."
)
def prune_command(older_than: str | None, keep_size: str | None) -> None:
    """Remove unused images (fetched or unpacked), then every unpacked layer and blob no
    remaining image needs."""
    result = ImageStore().prune(
        older_than_s=parse_duration(older_than) if older_than else None,
        keep_size=parse_size(keep_size) if keep_size else None,
    )
    for manifest in result.images:
        click.echo(f"removed {manifest[7:19]}")
    click.echo(
        f"{len(result.images)} images removed ({result.layers} unpacked layers, "
        f"{result.blobs} blobs), {human_size(result.bytes_freed)} freed"
    )


def layers_mode() -> str:
    """How this machine keeps layers, in one line (``sandlot image list``)."""
    mode = settings().image_layers
    if mounting():
        return "one squashfs file each, mounted with FUSE (squashfuse)"
    why = (
        "SANDLOT_IMAGE_LAYERS=unpack"
        if mode == "unpack"
        else "FUSE unusable here: /dev/fuse not openable or squashfuse/tar2sqfs missing"
    )
    return f"a directory each, made by unpacking (the fallback: {why})"


def _print_table(table: Table) -> None:
    """Print ``table`` to stdout; to a pipe or a file as wide as its rows (an image name is
    never wrapped there, so ``sandlot image list | grep`` finds it whole)."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=100_000)  # a table is only as wide as its cells need
    console.print(table)
