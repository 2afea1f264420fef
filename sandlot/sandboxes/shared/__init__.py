"""The parts that backends inherit: a backend whose platform offers a streamed exec, polled
jobs or a SWE-ReX server composes them instead of writing its own, and the in-sandbox shell
snippets (process marking, killing, sessions) that give every exec the contract's semantics."""
