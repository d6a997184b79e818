"""A fixed-size ring buffer for the last N latency samples."""


class RingBuffer:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[float] = []
        self.start = 0

    def push(self, value: float) -> None:
        if len(self.items) < self.capacity:
            self.items.append(value)
        else:
            self.items[self.start] = value
            self.start = (self.start + 1) % self.capacity

    def values(self) -> list[float]:
        return self.items[self.start:] + self.items[:self.start]

    def p99(self) -> float:
        ordered = sorted(self.items)
        return ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0
