"""glassbox's own API with httpx: JSON, binary frames, and what an error looks like.

Usage: python examples/classify_httpx.py [BASE_URL]   (default http://127.0.0.1:8000)
"""

import struct
import sys

import httpx

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"


def frames(texts: dict[int, str]) -> bytes:
    """u32 LE byte length | UTF-8 text | u64 LE user id, per text."""
    body = b""
    for user_id, text in texts.items():
        data = text.encode()
        body += struct.pack("<I", len(data)) + data + struct.pack("<Q", user_id)
    return body


with httpx.Client(base_url=URL, timeout=30) as client:
    texts = ["A warm, funny and beautifully acted film.", "Two hours I will never get back."]
    response = client.post("/v1/classify", json={"texts": texts, "top_k": 2})
    response.raise_for_status()
    for text, result in zip(texts, response.json()["results"], strict=True):
        print(f"{result['label']:>10} {result['score']:.3f}  {text}")
    print("server timing:", response.headers["server-timing"])

    response = client.post("/v1/classify", content=frames({7: texts[0], 42: texts[1]}),
                           headers={"content-type": "application/x-glassbox-frames"})
    response.raise_for_status()
    for user_id, result in response.json()["results"].items():
        print(f"user {user_id}: {result['label']}")

    # Bad input is a 4xx with a stable code and a message that says what to change.
    response = client.post("/v1/classify", json={"txt": "typo"})
    error = response.json()["error"]
    print(f"{response.status_code} {error['code']}: {error['message']}")
    assert 400 <= response.status_code < 500
