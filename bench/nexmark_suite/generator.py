"""The Nexmark event generator: a deterministic stream of persons, auctions and bids (pure, no I/O).

A port of the reference generator's rules (github.com/nexmark/nexmark, ``nexmark-flink/.../generator``,
itself from Apache Beam's ``sdks/java/testing/nexmark``), so the queries see the data they were written
for. The facts carried over:

* **Mix**: event ``n`` is a person, an auction or a bid by ``n mod 50``: 1 person, then 3 auctions, then
  46 bids in every 50 events.
* **Ids**: persons and auctions are numbered in order from 1000 (``FIRST_PERSON_ID``,
  ``FIRST_AUCTION_ID``); the id follows from the event number alone. Categories are 10..14.
* **Sellers** (auctions): 3 times in 4 the "hot" seller, the first person of the current batch of 100
  persons; otherwise a random one of the last 1000 persons (plus 10 ids ahead: a few auctions name a
  person who appears just after them).
* **Bids**: the auction is 1 time in 2 the hot one (the first of the current batch of 100 auctions),
  otherwise a random one of the last 100 auctions in flight (plus 10 ahead); the bidder 3 times in 4 the
  hot bidder (the second person of the current batch of 100), otherwise a random active person.
  The channel is 1 time in 2 one of four hot channels (Google, Facebook, Baidu, Apple, each with its
  url), otherwise one of 10,000 ``channel-<i>`` with a url that mostly ends in ``&channel_id=<n>``.
* **Prices**: ``round(10 ** (6 u) * 100)`` for uniform ``u``: 100 to 100,000,000 cents, log-uniform.
  An auction's reserve is its initial bid plus another such price.
* **Expiry**: an auction lasts 1 ms + uniform over twice the event time until 100 more auctions (the
  in-flight count) would have been generated, so about 100 auctions are open at any time.
* **Sizes**: ``extra`` pads each record to an average size (person 200, auction 500, bid 100 bytes
  counted as the reference counts: 8 per number plus the strings), uniform within +-20 %.
* **Event time**: event ``n`` happens at ``base_time + n * 1e6 / rate`` us (truncated to ms), so event
  time advances at the configured rate; the producer emits it at that wall-clock time when it paces.

One correction to the Flink port: its bid generator adds ``FIRST_PERSON_ID`` to the bidder twice (ids
around 2000 for persons numbered from 1000); Beam's adds it once, as here, so bidders are persons.

Randomness is Python's ``random.Random(seed)`` (not Java's SplittableRandom): the same seed gives the
same events, record for record, not the reference's exact values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .model import AUCTION, BID, PERSON, NexmarkTable

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10  # ids of persons / auctions not generated yet that may be referenced
AUCTION_ID_LEAD = 10
HOT_BATCH = 100  # the hot seller / bidder / auction is the first (second) of the current batch of 100

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000
MIN_STRING_LENGTH = 3
_EXTRA_POOL_CHARS = 1 << 20  # extra padding is a slice of one random 1 MiB string, as in the reference

DEFAULT_EVENT_RATE = 10_000  # events/s of event time when the producer does not pace (the reference's)


@dataclass(frozen=True)
class GeneratorConfig:
    """What to generate. The defaults are the reference's ``NexmarkConfiguration`` defaults."""

    seed: int = 0
    events: int = 100_000  # how many events (persons + auctions + bids)
    event_rate: float = DEFAULT_EVENT_RATE  # events per second of event time
    base_time_ms: int = 1_700_000_000_000  # event time of event 0 (epoch ms)
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100
    hot_auction_ratio: int = 2  # 1 - 1/2 of bids are for the hot auction
    hot_sellers_ratio: int = 4  # 1 - 1/4 of auctions are by the hot seller
    hot_bidders_ratio: int = 4  # 1 - 1/4 of bids are by the hot bidder
    in_flight_auctions: int = 100
    active_people: int = 1000
    first_event_id: int = 0

    def __post_init__(self) -> None:
        if self.events < 0:
            raise ValueError(f"events must be >= 0, got {self.events}")
        if self.event_rate <= 0:
            raise ValueError(f"event_rate must be > 0 events/s, got {self.event_rate}")
        if min(self.person_proportion, self.auction_proportion, self.bid_proportion) < 1:
            raise ValueError("person, auction and bid proportions must each be >= 1")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def timestamp_for_event(self, number: int) -> int:
        """Event time (epoch ms) of event ``number``: the reference's ``baseTime + (long)(n * delayUs) / 1000``."""
        return self.base_time_ms + int(number * (1e6 / self.event_rate)) // 1000

    def table_of(self, number: int) -> str:
        """``"person"``, ``"auction"`` or ``"bid"``: the kind of event ``number`` (the mix is by position)."""
        kind = (self.first_event_id + number) % self.total_proportion
        if kind < self.person_proportion:
            return "person"
        return "auction" if kind < self.person_proportion + self.auction_proportion else "bid"

    # --- ids: pure functions of the event id, as in the reference ---------------------------------------

    def last_base0_person_id(self, event_id: int) -> int:
        """The last person generated at or before ``event_id`` (base 0; the current one if it is a person)."""
        epoch, offset = divmod(event_id, self.total_proportion)
        if offset >= self.person_proportion:
            offset = self.person_proportion - 1
        return epoch * self.person_proportion + offset

    def last_base0_auction_id(self, event_id: int) -> int:
        """The last auction generated at or before ``event_id`` (base 0; -1 before the first)."""
        epoch, offset = divmod(event_id, self.total_proportion)
        if offset < self.person_proportion:
            epoch -= 1
            offset = self.auction_proportion - 1
        elif offset >= self.person_proportion + self.auction_proportion:
            offset = self.auction_proportion - 1
        else:
            offset -= self.person_proportion
        return epoch * self.auction_proportion + offset


@dataclass(frozen=True, slots=True)
class Event:
    """One generated event: which table it belongs to, its record (the JSON object), its number."""

    table: NexmarkTable
    row: dict[str, Any]
    number: int  # 0-based position in the stream
    date_time: int  # event time, epoch ms (= row["date_time"])


def _java_int_reverse_abs(i: int) -> int:
    """``Math.abs(Integer.reverse(i))`` of Java (32-bit two's complement)."""
    reversed_bits = int(f"{i & 0xFFFFFFFF:032b}"[::-1], 2)
    signed = reversed_bits - (1 << 32) if reversed_bits >= 1 << 31 else reversed_bits
    return abs(signed)


class NexmarkGenerator:
    """``for event in NexmarkGenerator(config)``: the events in order (see the module doc for the rules)."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._rand: Callable[[], float] = self._rng.random
        # The reference builds these from a random generator of their own at class load; here from the seed.
        tables = random.Random(config.seed ^ 0x5EED)
        table_int = self._int_of(tables.random)
        self._pool = "".join(tables.choices("abcdefghijklmnopqrstuvwxyz", k=_EXTRA_POOL_CHARS))
        self._hot_urls = tuple(self._base_url(tables.random) for _ in HOT_CHANNELS)
        urls = []
        for i in range(CHANNELS):
            url = self._base_url(tables.random)
            if table_int(10) > 0:
                url += f"&channel_id={_java_int_reverse_abs(i)}"
            urls.append((f"channel-{i}", url))
        self._channels = tuple(urls)
        self._credit_card_groups = tuple(f"{i:04d}" for i in range(10_000))
        self.generated = 0

    # --- random helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _int_of(rand: Any) -> Any:
        def next_int(n: int) -> int:
            """Uniform in ``[0, n)``."""
            return int(rand() * n)
        return next_int

    def _next_int(self, n: int) -> int:
        return int(self._rand() * n)

    def _next_string(self, max_length: int, special: str = " ", rand: Any = None) -> str:
        """3 to ``max_length - 1`` letters, 1 in 13 of them ``special``, then trimmed (the reference's nextString)."""
        rand = rand or self._rand
        length = MIN_STRING_LENGTH + int(rand() * (max_length - MIN_STRING_LENGTH))
        chars = [special if int(rand() * 13) == 0 else chr(97 + int(rand() * 26)) for _ in range(length)]
        return "".join(chars).strip()

    def _base_url(self, rand: Any) -> str:
        parts = [self._next_string(5, "_", rand) for _ in range(3)]
        return "https://www.nexmark.com/" + "/".join(parts) + "/item.htm?query=1"

    def _exact_string(self, length: int) -> str:
        offset = self._next_int(_EXTRA_POOL_CHARS - length)
        return self._pool[offset:offset + length]

    def _extra(self, current_size: int, average_size: int) -> str:
        """Padding so that ``current_size + len(extra)`` averages ``average_size`` (+-20 %, uniform)."""
        if current_size > average_size:
            return ""
        wanted = average_size - current_size
        delta = round(wanted * 0.2)
        size = wanted - delta + (self._next_int(2 * delta) if delta else 0)
        return self._exact_string(size)

    def _price(self) -> int:
        return round(math.pow(10.0, self._rand() * 6.0) * 100.0)

    def _next_base0_person_id(self, event_id: int) -> int:
        """A random active person (the last ``active_people``), or one of the next ``PERSON_ID_LEAD``."""
        people = self.config.last_base0_person_id(event_id) + 1
        active = min(people, self.config.active_people)
        return people - active + self._next_int(active + PERSON_ID_LEAD)

    def _next_base0_auction_id(self, event_id: int) -> int:
        """A random auction likely still in flight, or one of the next ``AUCTION_ID_LEAD``."""
        last = self.config.last_base0_auction_id(event_id)
        low = max(last - self.config.in_flight_auctions, 0)
        return low + self._next_int(last - low + 1 + AUCTION_ID_LEAD)

    # --- records ----------------------------------------------------------------------------------------

    def _person(self, event_id: int, timestamp: int) -> dict[str, Any]:
        person_id = self.config.last_base0_person_id(event_id) + FIRST_PERSON_ID
        name = FIRST_NAMES[self._next_int(len(FIRST_NAMES))] + " " + LAST_NAMES[self._next_int(len(LAST_NAMES))]
        email = self._next_string(7) + "@" + self._next_string(5) + ".com"
        groups = self._credit_card_groups
        credit_card = " ".join(groups[self._next_int(len(groups))] for _ in range(4))
        city = US_CITIES[self._next_int(len(US_CITIES))]
        state = US_STATES[self._next_int(len(US_STATES))]
        size = 8 + len(name) + len(email) + len(credit_card) + len(city) + len(state)
        return {"id": person_id, "name": name, "email_address": email, "credit_card": credit_card, "city": city,
                "state": state, "date_time": timestamp,
                "extra": self._extra(size, self.config.avg_person_bytes)}

    def _auction_length_ms(self, number: int, timestamp: int) -> int:
        """1 ms + uniform over twice the time until ``in_flight_auctions`` more auctions are generated."""
        config = self.config
        events_for_auctions = config.in_flight_auctions * config.total_proportion // config.auction_proportion
        horizon = config.timestamp_for_event(number + events_for_auctions) - timestamp
        return 1 + self._next_int(max(horizon * 2, 1))

    def _auction(self, number: int, event_id: int, timestamp: int) -> dict[str, Any]:
        config = self.config
        auction_id = config.last_base0_auction_id(event_id) + FIRST_AUCTION_ID
        if self._next_int(config.hot_sellers_ratio) > 0:
            seller = (config.last_base0_person_id(event_id) // HOT_BATCH) * HOT_BATCH
        else:
            seller = self._next_base0_person_id(event_id)
        seller += FIRST_PERSON_ID
        category = FIRST_CATEGORY_ID + self._next_int(NUM_CATEGORIES)
        initial_bid = self._price()
        expires = timestamp + self._auction_length_ms(number, timestamp)
        item_name = self._next_string(20)
        description = self._next_string(100)
        reserve = initial_bid + self._price()
        size = 8 + len(item_name) + len(description) + 8 + 8 + 8 + 8 + 8
        return {"id": auction_id, "item_name": item_name, "description": description, "initial_bid": initial_bid,
                "reserve": reserve, "date_time": timestamp, "expires": expires, "seller": seller,
                "category": category, "extra": self._extra(size, config.avg_auction_bytes)}

    def _bid(self, event_id: int, timestamp: int) -> dict[str, Any]:
        config = self.config
        if self._next_int(config.hot_auction_ratio) > 0:
            auction = (config.last_base0_auction_id(event_id) // HOT_BATCH) * HOT_BATCH
        else:
            auction = self._next_base0_auction_id(event_id)
        auction += FIRST_AUCTION_ID
        if self._next_int(config.hot_bidders_ratio) > 0:
            bidder = (config.last_base0_person_id(event_id) // HOT_BATCH) * HOT_BATCH + 1
        else:
            bidder = self._next_base0_person_id(event_id)
        bidder += FIRST_PERSON_ID
        price = self._price()
        if self._next_int(2) > 0:
            i = self._next_int(len(HOT_CHANNELS))
            channel, url = HOT_CHANNELS[i], self._hot_urls[i]
        else:
            channel, url = self._channels[self._next_int(CHANNELS)]
        return {"auction": auction, "bidder": bidder, "price": price, "channel": channel, "url": url,
                "date_time": timestamp, "extra": self._extra(8 + 8 + 8 + 8, config.avg_bid_bytes)}

    # --- the stream -------------------------------------------------------------------------------------

    def next_event(self) -> Event:
        """The next event (raises ``StopIteration`` after ``config.events``)."""
        config = self.config
        number = self.generated
        if number >= config.events:
            raise StopIteration
        event_id = config.first_event_id + number
        timestamp = config.timestamp_for_event(number)
        kind = event_id % config.total_proportion
        if kind < config.person_proportion:
            table, row = PERSON, self._person(event_id, timestamp)
        elif kind < config.person_proportion + config.auction_proportion:
            table, row = AUCTION, self._auction(number, event_id, timestamp)
        else:
            table, row = BID, self._bid(event_id, timestamp)
        self.generated = number + 1
        return Event(table, row, number, timestamp)

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        return self.next_event()


def generate(config: GeneratorConfig) -> list[Event]:
    """All the events of ``config``, in order (for tests and oracles: the same seed, the same list)."""
    return list(NexmarkGenerator(config))
