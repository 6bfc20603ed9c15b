"""Optional integrations with external training engines (veRL). Nothing here is imported by the core.

Each integration imports its engine lazily, so `import sqlrl.integrations.<name>` works without it.
"""
