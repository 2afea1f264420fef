"""Training with verl: the agent loop, its registration, and ``sandlot train``.

* :mod:`sandlot.trainer.agent_loop`: ``SandlotAgentLoop``, verl's ``AgentLoopBase`` running the
  rollout core (:func:`sandlot.rollout.run_episode`) with a token-in/token-out policy over
  ``server_manager.generate`` (needs verl; imported lazily by verl's workers).
* :mod:`sandlot.trainer.mapping`: the one function from a :class:`~sandlot.rollout.Trajectory`
  and its token buffer to verl's ``AgentLoopOutput``.
* :mod:`sandlot.trainer.drift`: compares an incrementally built token buffer with the chat
  template's rendering of the same messages.
* :mod:`sandlot.trainer.launch`: the ``agent_loop_config_path`` YAML and verl's fully-async (or
  synchronous) trainer command, composed and validated on CPU by ``sandlot train --dry-run``.

Nothing here is imported by ``import sandlot``; verl, torch and ray are the ``train`` extra.
"""
