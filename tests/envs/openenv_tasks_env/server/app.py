"""The task-API test environment's app, built with OpenEnv's create_app."""

import os

from openenv.core.env_server.http_server import create_app

try:
    from ..models import AnswerAction, QuestionObservation
    from .tasks_environment import TasksEnvironment
except ImportError:
    from models import AnswerAction, QuestionObservation
    from server.tasks_environment import TasksEnvironment

app = create_app(
    TasksEnvironment, AnswerAction, QuestionObservation, env_name="tasks_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "8")),
)
