"""Set an instance up once, fork it n times: the samples of one key share one set-up.

``group`` is ``sandlot.open_group``; ``cache`` the ``SetupCache`` every caller of a group size
uses (rollout, the verl agent loop, ``sandlot eval``); ``table`` the one state machine that
decides who sets a key up, who waits and when a snapshot goes; ``actor`` hosts that table in a
named Ray actor so the processes of a node (or a cluster) share their set-ups.
"""
