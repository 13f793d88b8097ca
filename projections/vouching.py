"""Whose word a run's chain rests on: the one signature check per run that authenticates it.

A writer signs each event's chain hash, and a chain hash commits to every event before it, so the newest
event signed by a trusted key vouches for the run up to there. While the chain is walked, each event's
claimed signer is looked up (no cryptography); at the end the newest trusted-looking signature is verified
once. Anything after it — unsigned, signed by an unknown or revoked key — is named by its first event.
A run with no signature at all is a log from before signing: acted on only when the trust list says so.
"""

import msgspec

from events.signing import EVENT_DOMAIN, Signature, TrustList, signature_valid


class Unvouched(msgspec.Struct, frozen=True):
    """The first event no trusted signature covers, and why."""

    seq: int
    stream_seq: int
    event_type: str
    reason: str


class Vouched(msgspec.Struct, frozen=True):
    """A run a trusted writer vouches for (`signer` names it), or an unsigned run accepted (`signer` None)."""

    signer: str | None


class _Claim(msgspec.Struct, frozen=True):
    """The newest event whose signer is a trusted key, as claimed (not yet verified)."""

    seq: int
    stream_seq: int
    event_type: str
    hash: str
    signature: Signature


class _Run(msgspec.Struct):
    claim: _Claim | None = None
    after: Unvouched | None = None
    signed: bool = False


class Vouching:
    """Tracks, per run, the newest event a trusted key claims and the first event after it."""

    def __init__(self, trust: TrustList) -> None:
        self.trust = trust
        self._runs: dict[str, _Run] = {}
        self._verified: dict[tuple[str, str, str], bool] = {}

    def see(
        self, run_id: str, seq: int, stream_seq: int, event_type: str, chain_hash: str, sig: Signature | None
    ) -> None:
        """Note one event that extended its run's chain."""
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
        if sig is not None:
            run.signed = True
            if self.trust.name(sig.signer) is not None:
                run.claim, run.after = _Claim(seq, stream_seq, event_type, chain_hash, sig), None
                return
        if run.after is None:
            why = "unsigned" if sig is None else f"signed by {self.trust.describe(sig.signer)}"
            run.after = Unvouched(seq, stream_seq, event_type, why)

    def verdict(self, run_id: str) -> Vouched | Unvouched | None:
        """Who vouches for the run's chain as walked so far, or its first unvouched event (None: no event)."""
        run = self._runs.get(run_id)
        if run is None:
            return None
        if run.after is not None:
            if not run.signed and self.trust.accept_unsigned:
                return Vouched(None)
            return run.after
        claim = run.claim
        assert claim is not None  # an event was seen, and none came after the claim
        sig = claim.signature
        key = (sig.signer, sig.sig, claim.hash)
        valid = self._verified.get(key)
        if valid is None:
            valid = self._verified[key] = signature_valid(sig, EVENT_DOMAIN, claim.hash.encode())
        if not valid:
            reason = f"its signature, claiming {self.trust.describe(sig.signer)}, does not verify"
            return Unvouched(claim.seq, claim.stream_seq, claim.event_type, reason)
        return Vouched(self.trust.name(sig.signer))
