"""The work that several commands share: training a config (train.py), predicting it on this machine (predict.py)."""
