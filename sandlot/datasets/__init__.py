"""Dataset rows: the :class:`Instance` model, loaders, and swebench-derived test settings."""

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import (
    DatasetError,
    instance_from_record,
    iter_instances,
    load_instances,
)
from sandlot.datasets.swebench_specs import SpecError, resolve_log_parser, resolve_test_cmd

__all__ = [
    "DatasetError",
    "Instance",
    "SpecError",
    "instance_from_record",
    "iter_instances",
    "load_instances",
    "resolve_log_parser",
    "resolve_test_cmd",
]
