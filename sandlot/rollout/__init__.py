"""The rollout layer: the agent loop core, ``agent_config.yaml``, model clients, the scheduler."""

from sandlot.rollout.agent import run_episode
from sandlot.rollout.config import AgentConfig, ConfigError, load_agent_config
from sandlot.rollout.episodes import InProcessEpisodes
from sandlot.rollout.errors import RolloutError, TrajectoryFileError
from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.policy import ContextLengthError, Policy, PolicyError, PolicyTurn
from sandlot.rollout.ray_episodes import RayEpisodes
from sandlot.rollout.report import write_report
from sandlot.rollout.rows import load_rows
from sandlot.rollout.scheduler import run_rollout
from sandlot.rollout.store import TrajectoryLog, iter_trajectories
from sandlot.rollout.summary import RolloutSummary, summarize
from sandlot.rollout.trajectory import ExitReason, Trajectory

__all__ = [
    "AgentConfig",
    "ConfigError",
    "ContextLengthError",
    "ExitReason",
    "InProcessEpisodes",
    "OpenAIChatPolicy",
    "Policy",
    "PolicyError",
    "PolicyTurn",
    "RayEpisodes",
    "RolloutError",
    "RolloutSummary",
    "Trajectory",
    "TrajectoryFileError",
    "TrajectoryLog",
    "iter_trajectories",
    "load_agent_config",
    "load_rows",
    "run_episode",
    "run_rollout",
    "summarize",
    "write_report",
]
