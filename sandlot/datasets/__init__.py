"""Dataset rows: the :class:`Instance` model, loaders, swebench-derived test settings, and the
verl parquet rows of ``sandlot data`` (:class:`TaskRow`, :func:`validate_file`)."""

from sandlot.datasets.errors import DatasetError
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import (
    instance_from_record,
    iter_instances,
    load_instances,
)
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.swebench_specs import SpecError, resolve_log_parser, resolve_test_cmd
from sandlot.datasets.validate import validate_file

__all__ = [
    "DatasetError",
    "Instance",
    "SpecError",
    "TaskRow",
    "instance_from_record",
    "iter_instances",
    "load_instances",
    "resolve_log_parser",
    "resolve_test_cmd",
    "validate_file",
]
