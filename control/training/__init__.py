"""Training the RoBERTa length model: from prompt sets or the SQL history, and its registry."""
