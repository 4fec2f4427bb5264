"""Wire types of the task-API test environment."""

from openenv.core.env_server.types import Action, Observation


class AnswerAction(Action):
    """Answer the question."""

    answer: str


class QuestionObservation(Observation):
    question: str = ""
    feedback: str = ""
