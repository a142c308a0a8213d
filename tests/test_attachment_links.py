"""Signed download links: ``POST /v1/attachments/<id>/link`` and the download it names.

One node. A link opens its file without the bearer token, inline for a PDF or
an image and as a download otherwise; it is refused once expired, for
another attachment, when forged, when its token is revoked, and it is never
issued to a member who may not read the file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from node.attachment_links import LINK_SECONDS, signature
from storage import directory
from storage.pg import connect
from tests.nodes import World, make_channel, running_node

PDF = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489")


async def exchange(
    port: int, method: str, target: str, token: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; the status, headers (lower-cased names) and body."""
    http = h11.Connection(h11.CLIENT)
    headers = [("host", f"127.0.0.1:{port}"), ("content-length", "0")]
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            http.send(h11.Request(method=method, target=target, headers=headers))
            + http.send(h11.EndOfMessage())
        )
        status, answer, body = 0, {}, b""
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                http.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                answer = {k.decode(): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, answer, body


async def test_a_signed_link_opens_its_file_for_a_minute_and_nothing_else(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with running_node(database_url, tmp_path) as node:
            port = node.services.port
            world = await World.create(node)
            ann, bob, carl = await world.members("ann", "bob", "carl")
            async with world.client(ann) as a, world.client(bob) as b:
                await make_channel(a, "room", b)
                ids = {}
                for name, data, kind in (
                    ("report.pdf", PDF, "application/pdf"),
                    ("dot.png", PNG, "image/png"),
                    ("notes.txt", b"plain", "text/plain"),
                ):
                    ids[name] = (await a.upload(data, name, kind))["attachmentId"]
                await a.send("#room", "files", attachmentIds=list(ids.values()))

                async def link(token: str, attachment_id: str) -> tuple[int, dict[str, str]]:
                    path = f"/v1/attachments/{attachment_id}/link"
                    status, _, body = await exchange(port, "POST", path, token)
                    return status, json.loads(body)

                status, issued = await link(bob.token, ids["report.pdf"])
                assert status == 200, issued
                assert issued["expiresAt"].endswith("Z")
                status, headers, body = await exchange(port, "GET", issued["url"])
                assert (status, body) == (200, PDF)
                assert headers["content-type"] == "application/pdf"
                assert headers["content-disposition"].startswith("inline;")
                assert headers["x-content-type-options"] == "nosniff"
                assert "sandbox" not in headers["content-security-policy"]

                _, png = await link(bob.token, ids["dot.png"])
                status, headers, body = await exchange(port, "GET", png["url"])
                assert (status, body) == (200, PNG)
                assert headers["content-disposition"].startswith("inline;")
                assert headers["content-security-policy"] == "default-src 'none'; sandbox"
                _, txt = await link(bob.token, ids["notes.txt"])
                status, headers, _ = await exchange(port, "GET", txt["url"])
                assert status == 200
                assert headers["content-disposition"].startswith("attachment;")

                # Not a member of the channel: no link, as for an unknown id.
                status, refused = await link(carl.token, ids["report.pdf"])
                assert (status, refused["code"]) == (404, "not_found")
                status, _ = await link("snt_not-a-token", ids["report.pdf"])
                assert status == 401

                # The signature covers the attachment, the credential and the expiry.
                path, _, query = issued["url"].partition("?")
                other = f"/v1/attachments/{ids['dot.png']}?{query}"
                assert (await exchange(port, "GET", other))[0] == 403
                fields = {k: v[0] for k, v in parse_qs(urlsplit(issued["url"]).query).items()}
                credential = int(fields["credential"])
                key = directory.token_hash(bob.token)
                for expires in (int(time.time()) - 1, int(time.time()) + 10 * LINK_SECONDS):
                    signed = signature(key, ids["report.pdf"], credential, expires)
                    forged = f"{path}?credential={credential}&expires={expires}&signature={signed}"
                    status, _, body = await exchange(port, "GET", forged)
                    assert status == 403, body
                for broken in ("signature=zz", "credential=1&expires=x&signature=00"):
                    assert (await exchange(port, "GET", f"{path}?{broken}"))[0] == 403

                # Bob leaves: his link no longer reads the file.
                await b.request("leave", scopeId=(await a.history("#room"))["scopeId"])
                assert (await exchange(port, "GET", png["url"]))[0] == 404
            # Revoking the token ends its links.
            _, again = await link(ann.token, ids["notes.txt"])
            async with await connect(database_url, autocommit=True) as conn:
                await directory.revoke_token(conn, ann.token)
            assert (await exchange(port, "GET", again["url"]))[0] == 403
