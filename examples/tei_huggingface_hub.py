"""glassbox as a Hugging Face TEI endpoint, with huggingface_hub's InferenceClient (pip install huggingface_hub).

Usage: python examples/tei_huggingface_hub.py [BASE_URL]   (default http://127.0.0.1:8000)
"""

import sys

from huggingface_hub import InferenceClient

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"

client = InferenceClient(model=URL)  # the base URL, as for TEI; token=... with an API key
for text in ("A warm, funny and beautifully acted film.", "Two hours I will never get back."):
    answer = client.text_classification(text)  # the best label (older huggingface_hub versions: a list, best first)
    best = answer[0] if isinstance(answer, list) else answer
    print(f"{best.label:>10} {best.score:.3f}  {text}")
