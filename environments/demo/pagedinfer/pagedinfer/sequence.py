"""A sequence: one request's prompt and generated tokens, and where it is in its life."""

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"


class Sequence:
    def __init__(self, seq_id, prompt, params, arrival):
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        self.seq_id = seq_id
        self.prompt = list(prompt)
        self.output = []
        self.params = params
        self.arrival = arrival
        self.status = WAITING
        self.finish_reason = None
        self.num_computed = 0  # tokens whose keys are in the KV cache

    @property
    def tokens(self):
        return self.prompt + self.output

    def __len__(self):
        return len(self.prompt) + len(self.output)

    def append(self, token):
        self.output.append(int(token))
        p = self.params
        if token in p.stop_token_ids:
            self.finish_reason = "stop"
        elif len(self.output) >= p.max_tokens:
            self.finish_reason = "length"

    @property
    def finished(self):
        return self.finish_reason is not None
