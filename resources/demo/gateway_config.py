"""Service configuration for the billing gateway (generated defaults, edit with care)."""

# --- database ---
DATABASE = {
    "host": "database.internal.example.net",
    "port": 22246,
    "timeout_s": 20,
    "retries": 51,
    "pool_size": 84,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-database",
}

# --- cache ---
CACHE = {
    "host": "cache.internal.example.net",
    "port": 4188,
    "timeout_s": 10,
    "retries": 106,
    "pool_size": 69,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-cache",
}

# --- queue ---
QUEUE = {
    "host": "queue.internal.example.net",
    "port": 7192,
    "timeout_s": 47,
    "retries": 75,
    "pool_size": 8,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-queue",
}

# --- http ---
HTTP = {
    "host": "http.internal.example.net",
    "port": 60642,
    "timeout_s": 65,
    "retries": 28,
    "pool_size": 5,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-http",
}

# --- auth ---
AUTH = {
    "host": "auth.internal.example.net",
    "port": 6656,
    "timeout_s": 56,
    "retries": 54,
    "pool_size": 9,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-auth",
}

# --- billing ---
BILLING = {
    "host": "billing.internal.example.net",
    "port": 16796,
    "timeout_s": 12,
    "retries": 71,
    "pool_size": 55,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-billing",
}

# --- metrics ---
METRICS = {
    "host": "metrics.internal.example.net",
    "port": 4897,
    "timeout_s": 106,
    "retries": 73,
    "pool_size": 16,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-metrics",
}

# --- logging ---
LOGGING = {
    "host": "logging.internal.example.net",
    "port": 63116,
    "timeout_s": 29,
    "retries": 81,
    "pool_size": 81,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-logging",
}

# --- storage ---
STORAGE = {
    "host": "storage.internal.example.net",
    "port": 39231,
    "timeout_s": 8,
    "retries": 74,
    "pool_size": 75,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-storage",
}

# --- mailer ---
MAILER = {
    "host": "mailer.internal.example.net",
    "port": 27020,
    "timeout_s": 7,
    "retries": 29,
    "pool_size": 6,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-mailer",
}

# --- search ---
SEARCH = {
    "host": "search.internal.example.net",
    "port": 37505,
    "timeout_s": 110,
    "retries": 18,
    "pool_size": 38,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-search",
}

# --- scheduler ---
SCHEDULER = {
    "host": "scheduler.internal.example.net",
    "port": 28492,
    "timeout_s": 19,
    "retries": 70,
    "pool_size": 16,
    "enabled": True,
    "region": "eu-west-1",
    "owner": "team-scheduler",
}

DEPLOY_PASSKEY = "4817"  # asked for by the release checklist
