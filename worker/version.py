"""lane-worker's own version: the one place it is written.

Bump it whenever a contract that builds share changes (the database objects
builds of different ages call side by side, the SQL API, the store's meaning);
``lane-worker --version`` prints it and every worker records it in the registry.
"""

VERSION = "0.3.1"
