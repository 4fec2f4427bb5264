"""openenv_gym for TRL: any env, or a weighted mixture of envs, as the three things GRPOTrainer takes.

``EnvSpec(id_or_mapping, ...)`` has the members of TRL's ``OpenRewardSpec``
(``train_dataset``, ``environment_factory``, ``reward_funcs``) for every id openenv_gym plays; see
:mod:`openenv_gym.trl.spec`. Importing this package needs neither torch nor TRL; the dataset needs
``datasets``, and TRL reads the tools' schemas with ``transformers``.
"""

from openenv_gym.trl.spec import Environment, EnvSpec, env_reward

__all__ = ["EnvSpec", "Environment", "env_reward"]
