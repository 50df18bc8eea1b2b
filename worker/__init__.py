"""lane-worker: durable Absurd runs that stay on the release that launched them."""

from worker.app import App
from worker.run.context import DetachedRunner, TaskContext

__all__ = ["App", "DetachedRunner", "TaskContext"]
