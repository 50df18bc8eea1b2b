"""The apps the e2e daemons run (``python -m worker run --app support.apps.<module>:<app>``).

- ``basic:app``: plain, sleeper, waiter, flaky, slow (the daemon, deploy and boot tests).
- ``faults:app``: stepper, blocking (database faults, drain).
- ``chaos:app``: chaos (the deploy-day chaos suite).
- ``mixed:lean``, ``mixed:full``, ``mixed:safety``: two apps of one release, and the retry
  and signal plays.
- ``drain:app``: plain, nap, waiter, fail-until, gated (lanes wait, the remedies).
- ``leaky:app``: leak-url (secrets shown nowhere).

Step bodies that a test must count record each execution in a file, so executions
survive a SIGKILL and can be counted across processes.
"""
