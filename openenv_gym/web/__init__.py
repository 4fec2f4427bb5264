"""Pages for people: ``openenv-gym view`` (read episodes) and ``openenv-gym play`` (be the agent).

Both are small aiohttp apps (aiohttp is already a dependency) serving one page of plain HTML,
CSS and JavaScript from ``static/``, with nothing fetched from the network:

* :mod:`~openenv_gym.web.rollouts` reads rollout and RecordEpisodes files, tolerating what a file
  can hold; :mod:`~openenv_gym.web.summary` computes the figures at the top of the page;
  :mod:`~openenv_gym.web.view` serves them or writes them into one self-contained file.
* :mod:`~openenv_gym.web.play` drives one env through the Gymnasium API for a page.
* :mod:`~openenv_gym.web.page` builds a page (inline assets, embedded data, its CSP),
  :mod:`~openenv_gym.web.access` keeps everyone without the printed token out, and
  :mod:`~openenv_gym.web.serving` runs an app on 127.0.0.1 until Ctrl-C.
"""
