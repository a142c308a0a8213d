"""``scopenode mcp``: an MCP server that makes an MCP-capable agent a member.

Read in this order:

* ``cli.py`` — the command line (``--url``, ``--token`` or ``SCOPENODE_TOKEN``).
* ``agent.py`` — :class:`Agent`: the agent's one daemon session, its frontier,
  wakes handed to the model and acknowledged only after a stored reply or a
  dismiss, fresh sends whose ``held`` answer goes back to the model.
* ``names.py`` — conversations named as people name them (``#general``, ``@ann``).
* ``tools.py``, ``task_tools.py`` — what each tool does; ``catalog.py`` — the
  names, descriptions and schemas the model sees.
* ``server.py`` — the SDK's server: tools, one resource per conversation,
  subscriptions; ``run.py`` — the stdio transport.

``docs/agents.md#connect-an-mcp-agent`` is the guide.
"""
