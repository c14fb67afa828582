"""The KServe v2 / Open Inference Protocol with Triton's own client (pip install 'tritonclient[http]').

Usage: python examples/kserve_tritonclient.py [BASE_URL]   (default http://127.0.0.1:8000)
"""

import sys
from urllib.parse import urlsplit

import httpx
import numpy as np
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"

client = triton.InferenceServerClient(urlsplit(URL).netloc)  # host:port, no scheme
try:
    assert client.is_server_ready()
    # The model's name is --model-name, by default the model directory's name. The v2 HTTP protocol has no call
    # that lists models; TEI's /info names it.
    name = httpx.get(URL + "/info", timeout=30).json()["model_id"]
    metadata = client.get_model_metadata(name)
    print("model", metadata["name"], "versions", metadata["versions"], "outputs",
          [output["name"] for output in metadata["outputs"]])

    texts = triton.InferInput("text", [2], "BYTES")
    texts.set_data_from_numpy(np.array([b"A warm, funny film.", b"Two hours I will never get back."],
                                       dtype=np.object_))
    result = client.infer(name, [texts], model_version="1")  # the versioned route, /versions/1/infer
    print("labels", [label.decode() for label in result.as_numpy("label")])
    print("probabilities", result.as_numpy("probabilities").round(3).tolist())

    # Errors come back in the protocol's shape, so the client's exception carries the server's message.
    try:
        client.infer(name, [texts], model_version="2")
    except InferenceServerException as error:
        print(f"{error.status()}: {error.message()}")
    else:
        raise SystemExit("version 2 should not exist")
finally:
    client.close()
