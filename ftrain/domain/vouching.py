"""Whose word a run's chain rests on: the one signature check per run that authenticates it.

A writer signs each event's chain hash, and a chain hash commits to every event before it, so the newest
event signed by a trusted key vouches for the run up to there. Anything after it — unsigned, signed by an
unknown or revoked key — is named by its first event. A run with no signature at all is a log from before
signing: acted on only when the trust list says so.

What a verdict needs is kept as the run's stretches: consecutive events with one signer, each with its first
event and its newest (hash and signature). They are facts of the log, never of the trust list, so the read
model stores them as it folds and `judge` weighs them against the trust list of the moment it is asked: a key
revoked or trusted later changes the verdict without re-reading the log. Only the newest trusted stretch's
last signature is verified, once.
"""

from collections.abc import Callable, Sequence

import msgspec

from ftrain.events.signing import EVENT_DOMAIN, Signature, TrustList, signature_valid


class Unvouched(msgspec.Struct, frozen=True):
    """The first event no trusted signature covers, and why."""

    seq: int
    stream_seq: int
    event_type: str
    reason: str


class Vouched(msgspec.Struct, frozen=True):
    """A run a trusted writer vouches for (`signer` names it), or an unsigned run accepted (`signer` None)."""

    signer: str | None


class Stretch(msgspec.Struct, frozen=True, array_like=True):
    """Consecutive events of one run with one signer (public key hex; None: unsigned): where the stretch
    starts, and its newest event with the chain hash and signature that vouch for everything up to it.
    `valid`: whether that signature verifies, once checked (None: not yet; it changes with the newest event)."""

    signer: str | None
    first_seq: int
    first_stream_seq: int
    first_type: str
    last_seq: int
    last_stream_seq: int
    last_type: str
    hash: str
    sig: str | None
    valid: bool | None = None

    def verifies(self) -> bool:
        """Whether the newest event's signature is its signer's over its chain hash (as checked, if it was)."""
        if self.valid is not None:
            return self.valid
        if self.signer is None or self.sig is None:
            return False
        return signature_valid(Signature(self.signer, self.sig), EVENT_DOMAIN, self.hash.encode())


def extend(
    stretches: list[Stretch],
    seq: int,
    stream_seq: int,
    event_type: str,
    chain_hash: str,
    sig: Signature | None,
) -> int:
    """Add one event that extended the run's chain to its stretches (in place); the index of the stretch
    that changed (the newest: extended, or begun by a signer other than the previous event's)."""
    signer, signature = (sig.signer, sig.sig) if sig is not None else (None, None)
    if stretches and stretches[-1].signer == signer:
        stretches[-1] = msgspec.structs.replace(
            stretches[-1],
            last_seq=seq,
            last_stream_seq=stream_seq,
            last_type=event_type,
            hash=chain_hash,
            sig=signature,
            valid=None,
        )
    else:
        stretches.append(
            Stretch(signer, seq, stream_seq, event_type, seq, stream_seq, event_type, chain_hash, signature)
        )
    return len(stretches) - 1


def judge(
    stretches: Sequence[Stretch], trust: TrustList, verifies: Callable[[Stretch], bool] = Stretch.verifies
) -> Vouched | Unvouched | None:
    """Who vouches for a run with these stretches under `trust`, or its first unvouched event (None: no
    event). `verifies` checks the one signature that decides (a caller may remember what it checked)."""
    if not stretches:
        return None
    trusted = [
        i for i, s in enumerate(stretches) if s.signer is not None and trust.name(s.signer) is not None
    ]
    if not trusted:
        if trust.accept_unsigned and all(s.signer is None for s in stretches):
            return Vouched(None)
        return _unvouched(stretches[0], trust)
    if trusted[-1] + 1 < len(stretches):
        return _unvouched(stretches[trusted[-1] + 1], trust)
    claim = stretches[-1]
    assert claim.signer is not None
    if not verifies(claim):
        reason = f"its signature, claiming {trust.describe(claim.signer)}, does not verify"
        return Unvouched(claim.last_seq, claim.last_stream_seq, claim.last_type, reason)
    return Vouched(trust.name(claim.signer))


def _unvouched(first: Stretch, trust: TrustList) -> Unvouched:
    """The first event of a stretch no trusted key signed."""
    why = "unsigned" if first.signer is None else f"signed by {trust.describe(first.signer)}"
    return Unvouched(first.first_seq, first.first_stream_seq, first.first_type, why)


class Vouching:
    """Keeps, per run, the stretches of the events walked so far, for `judge`."""

    def __init__(self, trust: TrustList) -> None:
        self.trust = trust
        self._runs: dict[str, list[Stretch]] = {}
        self._verified: dict[tuple[str | None, str | None, str], bool] = {}

    def see(
        self, run_id: str, seq: int, stream_seq: int, event_type: str, chain_hash: str, sig: Signature | None
    ) -> None:
        """Note one event that extended its run's chain."""
        extend(self._runs.setdefault(run_id, []), seq, stream_seq, event_type, chain_hash, sig)

    def verdict(self, run_id: str) -> Vouched | Unvouched | None:
        """Who vouches for the run's chain as walked so far, or its first unvouched event (None: no event)."""
        return judge(self._runs.get(run_id, ()), self.trust, self._verifies)

    def _verifies(self, claim: Stretch) -> bool:
        """`claim.verifies()`, once per signature: a run log folded again asks again."""
        key = (claim.signer, claim.sig, claim.hash)
        valid = self._verified.get(key)
        if valid is None:
            valid = self._verified[key] = claim.verifies()
        return valid
