"""The SQL history: typed models, migrations, the batched writer and the read-only query path."""
