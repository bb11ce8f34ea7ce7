"""Everything that learns, in River's shape: predict_one, learn_one, picklable state."""
