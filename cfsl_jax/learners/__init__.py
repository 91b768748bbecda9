"""Learners: each module exports a `Learner` of pure functions."""
