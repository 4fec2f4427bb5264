"""Network code the backends share: the httpx client factory and openenv_gym's own HTTP/1.1 connections."""
