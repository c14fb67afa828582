"""Composition roots of the serving layouts: the engine in this process, or an engine process fed by HTTP worker
processes under a supervisor."""
