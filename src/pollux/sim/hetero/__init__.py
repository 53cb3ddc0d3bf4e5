"""Simulating clusters of several GPU types from per-type traces (the Sia artifact's).

:mod:`.apps` reads an application's measurements per type with the reference
simulator's limits, restart delays and calibration; :mod:`.job` is a job that keeps one
throughput model per type; :mod:`.simulator` drives a policy over a typed cluster.
"""
