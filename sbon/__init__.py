"""SBoN Explorer: Speculative Rejection (fast Best-of-N decoding) on any transformers model."""

from .algorithms import METHODS, best_of_n, events, run, speculative_bon_tau, speculative_rejection
from .config import RunConfig
from .engine import Generator, SamplingConfig
from .errors import SBoNError
from .models import load_generator, load_reward
from .results import Candidate, RunResult

__all__ = ["METHODS", "RunConfig", "best_of_n", "events", "run", "speculative_bon_tau", "speculative_rejection",
           "Generator", "SamplingConfig", "SBoNError", "load_generator", "load_reward", "Candidate", "RunResult"]
