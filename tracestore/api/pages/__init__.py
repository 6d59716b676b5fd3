"""The rollout inspector's web pages: server-rendered HTML for people debugging rollouts.

`install.install(app)` adds them to the API. This package file stays empty on purpose:
api/deps.py imports `pages.session` (the browser sign-in), and the page routes import
api/deps.py.
"""
