"""The tool list a model sees: names, descriptions and argument schemas.

The descriptions are written for the model: what the tool is for, when to
call it, and what the answer means, in the words the workspace's people use.
"""

from __future__ import annotations

from node.mcp import task_tools, tools
from node.mcp.tools import CONVERSATION, MESSAGE_ID, Tool, object_schema

INSTRUCTIONS = (
    "You are a member of a team workspace: channels ('#general'), direct messages "
    "('@ann') and threads. Call wait_for_attention to be told when someone needs you; "
    "answer with send_message in the same conversation (that also marks the wake done), "
    "or dismiss it. Sends are checked for freshness: if people wrote while you were "
    "thinking, send_message stores nothing and shows you what you missed — read it, "
    "then send again only if your reply still stands."
)

TOOLS: list[Tool] = [
    Tool(
        "list_conversations",
        "List your conversations (channels, direct messages, threads, tasks) with "
        "their names, ids and unread counts, most recent activity first.",
        object_schema([]),
        tools.list_conversations,
    ),
    Tool(
        "read_messages",
        "Read messages of a conversation, oldest first: each with its id, seq, author "
        "and time, and a thread summary when it has replies. Without since you get the "
        "latest ones; with since you get those after that seq. Reading marks them read "
        "and lets your next send_message there go through.",
        object_schema(
            ["conversation"],
            conversation=CONVERSATION,
            since={"type": "integer", "minimum": 0, "description": "read messages after this seq"},
            limit={
                "type": "integer",
                "minimum": 1,
                "maximum": tools.MAX_READ,
                "description": f"how many messages (default {tools.DEFAULT_READ})",
            },
        ),
        tools.read_messages,
    ),
    Tool(
        "send_message",
        "Write a message in a conversation. Mention people with @handle. If messages "
        "arrived that you have not read, nothing is stored: you get them back and "
        "decide whether to send again. A stored reply also marks as done the wakes "
        "you had open in that conversation.",
        object_schema(
            ["conversation", "text"],
            conversation=CONVERSATION,
            text={"type": "string", "minLength": 1, "description": "the message (markdown)"},
            reply_to={
                **MESSAGE_ID,
                "description": "the message you are answering (marks its wake done)",
            },
            thread={
                **MESSAGE_ID,
                "description": "answer in the thread of this channel message instead",
            },
        ),
        tools.send_message,
    ),
    Tool(
        "wait_for_attention",
        "Wait until someone needs you: a mention, a direct message, a task assigned to "
        "you. Returns the message that woke you, why, and the latest messages of its "
        "conversation; returns empty after timeout_s. The wake stays open until you "
        "answer in that conversation or call dismiss.",
        object_schema(
            [],
            timeout_s={
                "type": "integer",
                "minimum": 0,
                "maximum": tools.MAX_WAIT_S,
                "description": "seconds to wait (default 60)",
            },
        ),
        tools.wait_for_attention,
    ),
    Tool(
        "dismiss",
        "Mark a wake done without answering (you decided there is nothing to say). "
        "Without wake_id, every open wake is dismissed.",
        object_schema(
            [], wake_id={"type": "string", "description": "the wake id wait_for_attention gave"}
        ),
        tools.dismiss,
    ),
    Tool(
        "react",
        "Add an emoji reaction to a message (or take yours back with remove: true).",
        object_schema(
            ["message_id", "emoji"],
            message_id=MESSAGE_ID,
            emoji={"type": "string", "description": "one emoji, or :short_name: like :+1:"},
            remove={"type": "boolean", "description": "take your reaction back"},
        ),
        tools.react,
    ),
    Tool(
        "search",
        "Search the messages you may read, newest first. The query takes words, "
        '"exact phrases", -excluded, from:@handle, in:#channel and '
        "before:/after:/on:YYYY-MM-DD.",
        object_schema(
            ["query"],
            query={"type": "string", "minLength": 1, "description": "what to look for"},
            conversation={**CONVERSATION, "description": "only this conversation"},
        ),
        tools.search,
    ),
    Tool(
        "edit_message",
        "Replace the text of one of your own messages.",
        object_schema(
            ["message_id", "text"],
            message_id=MESSAGE_ID,
            text={"type": "string", "minLength": 1, "description": "the new text"},
        ),
        tools.edit_message,
    ),
    Tool(
        "delete_message",
        "Delete one of your own messages (a tombstone stays in its place).",
        object_schema(["message_id"], message_id=MESSAGE_ID),
        tools.delete_message,
    ),
    Tool(
        "explain",
        "Why you were woken for a message: who mentioned you, where, and whether "
        "that wake is still open.",
        object_schema(["message_id"], message_id=MESSAGE_ID),
        tools.explain,
    ),
    Tool(
        "create_task",
        "Create a task and assign it to people (they are woken). Its discussion is "
        "the conversation task:<taskId>.",
        object_schema(
            ["title"],
            title={"type": "string", "minLength": 1, "maxLength": 200},
            description={"type": "string"},
            assignees={
                "type": "array",
                "items": {"type": "string"},
                "description": "'@handle's of the assignees",
            },
            channel={"type": "string", "description": "a '#channel' to post the task card in"},
        ),
        task_tools.create_task,
    ),
    Tool(
        "update_task",
        "Change a task's status, title or assignees (the whole new list).",
        object_schema(
            ["task_id"],
            task_id={"type": "string"},
            status={"type": "string", "enum": task_tools.STATUSES},
            title={"type": "string", "minLength": 1, "maxLength": 200},
            assignees={"type": "array", "items": {"type": "string"}},
        ),
        task_tools.update_task,
    ),
    Tool(
        "my_tasks",
        "List the tasks you created or are assigned, optionally with one status.",
        object_schema([], status={"type": "string", "enum": task_tools.STATUSES}),
        task_tools.my_tasks,
    ),
]

BY_NAME = {tool.name: tool for tool in TOOLS}
