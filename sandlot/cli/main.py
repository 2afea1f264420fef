"""The ``sandlot`` command line."""

from __future__ import annotations

import logging

import click

from sandlot import __version__
from sandlot.cli.audit_cmd import audit_command
from sandlot.cli.data_cmd import data_group
from sandlot.cli.env_cmd import env_group
from sandlot.cli.eval_cmd import eval_command
from sandlot.cli.gc_cmd import gc_command
from sandlot.cli.image_cmd import image_group
from sandlot.cli.rollout_cmd import report_command, rollout_command
from sandlot.cli.train_cmd import train_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sandlot")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """sandlot: sandboxes and SWE-bench style rewards for software-engineering agents."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


cli.add_command(eval_command)
cli.add_command(data_group)
cli.add_command(gc_command)
cli.add_command(image_group)
cli.add_command(env_group)
cli.add_command(rollout_command)
cli.add_command(report_command)
cli.add_command(audit_command)
cli.add_command(train_command)


def main() -> None:
    """Console-script entry point."""
    cli()
