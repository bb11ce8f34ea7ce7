"""The Streamlit dashboard over the SQL history (read-only)."""
