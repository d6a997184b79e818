"""A sixth retrieval workload, written before it was first run (2026-11-26, seventh pass) to judge a lever tried on
the other five: a platform team's day, with file kinds no other family has (a C++ header, CMake, Protocol Buffers,
an Ansible playbook, Spring properties, a Lua config) and facts stated in chat, some of them phrased as questions.

Invariants: as the day family's (`day_workload.make_day_session`): a session is a pure function of its seed, every
fact value is unique in its session, a probe comes at least three turns after its fact, in other words.
"""

from __future__ import annotations

from .day_workload import DayScript, make_day_session
from .recall_workload import Session

FACT_TYPES = ("cpp", "cmake", "proto", "ansible", "spring", "lua", "chat")

# type -> frames: (line with {v}, file kind, questions that avoid the line's words, value maker)
FRAMES: dict[str, list[tuple[str, str, list[str], str]]] = {
    "cpp": [
        ("constexpr std::size_t kRingBufferSlots = {v};", "cpp",
         ["How many entries fit in the lock-free queue of the audio engine?",
          "What capacity did we give the circular queue in the native core?"], "num"),
        ("constexpr int kMaxFrameSkip = {v};", "cpp",
         ["How many renders may the game loop drop to catch up?",
          "What is the limit on skipped draws when the simulation falls behind?"], "small"),
    ],
    "cmake": [
        ("set(CMAKE_CXX_STANDARD {v})", "cmake",
         ["Which C++ language revision does the build target?",
          "What edition of the language do we compile the native code against?"], "std"),
        ("cmake_minimum_required(VERSION {v})", "cmake",
         ["What is the oldest build-system release the project configures with?",
          "Which generator tool version must developers have at least?"], "cmake"),
    ],
    "proto": [
        ("  int32 page_size = {v};", "proto",
         ["What is the field number of the listing size in the search request message?",
          "Which tag does the results-per-call field carry in the wire format?"], "tag"),
        ("  repeated string labels = {v};", "proto",
         ["What wire tag do the item tags use in the schema?",
          "Which field number holds the list of categories in the protobuf?"], "tag"),
    ],
    "ansible": [
        ("        swap_size_mb: {v}", "ansible",
         ["How much paging space do the provisioned hosts get?",
          "What amount of virtual memory file does the playbook set up, in megabytes?"], "num"),
        ("        ntp_poll_interval: {v}", "ansible",
         ["How often do the servers check the time source?",
          "What is the clock sync period the provisioning applies?"], "small"),
    ],
    "spring": [
        ("spring.datasource.hikari.maximum-pool-size={v}", "spring",
         ["How many connections can the Java service hold open to the database?",
          "What is the upper bound of the JDBC connection reuse set in the backend?"], "small"),
        ("server.tomcat.threads.max={v}", "spring",
         ["How many workers does the embedded web container run at most?",
          "What is the ceiling on request-handling threads in the Java app?"], "num"),
    ],
    "lua": [
        ("  respawn_delay = {v},", "lua",
         ["How long do players wait before coming back into the match?",
          "After what pause does a defeated character return, per the game script?"], "small"),
        ("  max_party_size = {v},", "lua",
         ["How many people may join one group in the game?",
          "What is the team cap in the gameplay settings?"], "small"),
    ],
    "chat": [
        ("did I mention the release freeze starts in {v}?", "chat",
         ["From which day on can nothing ship anymore?",
          "When do we stop merging to the release branch?"], "month"),
        ("sanity check: the load balancer idle timeout is {v} seconds now, right?", "chat",
         ["How long can a quiet connection stay open at the front door before it is dropped?",
          "After how much silence does the traffic distributor cut a client?"], "num"),
        ("the crash-report sample rate is {v} percent in prod, remember that", "chat",
         ["What share of application failures gets uploaded in production?",
          "How much of the error reporting is kept live, as a percentage?"], "pct"),
    ],
}

VALUES = {
    "num": lambda rng: str(rng.randint(130, 9700)),
    "small": lambda rng: str(rng.randint(3, 64)),
    "std": lambda rng: rng.choice(("14", "17", "20", "23")),
    "cmake": lambda rng: f"3.{rng.randint(16, 29)}",
    "tag": lambda rng: str(rng.randint(5, 19)),
    "pct": lambda rng: str(rng.randint(2, 40)),
    "month": lambda rng: rng.choice(("March", "April", "June", "October", "November")),
}

FILLER = {
    "cpp": ["#pragma once", "", "#include <atomic>", "#include <cstddef>", "", "namespace engine::audio {", "",
            "struct MixerConfig {", "  float master_gain = 1.0f;", "  bool enable_reverb = true;", "};", "",
            "}  // namespace engine::audio"],
    "cmake": ["project(engine LANGUAGES CXX)", "", "option(ENGINE_BUILD_TESTS \"Build the tests\" ON)",
              "add_library(engine STATIC src/mixer.cpp src/loop.cpp)",
              "target_include_directories(engine PUBLIC include)", "if(ENGINE_BUILD_TESTS)",
              "  enable_testing()", "  add_subdirectory(tests)", "endif()"],
    "proto": ["syntax = \"proto3\";", "", "package catalog.v1;", "", "message SearchRequest {",
              "  string query = 1;", "  string cursor = 2;", "}", "", "message Item {", "  string id = 1;",
              "  string title = 2;", "}"],
    "ansible": ["- hosts: game_servers", "  become: true", "  vars:", "    base_packages:", "      - chrony",
                "      - htop", "  roles:", "    - role: base", "      vars:", "        timezone: UTC"],
    "spring": ["spring.application.name=catalog-service", "spring.jpa.open-in-view=false",
               "management.endpoints.web.exposure.include=health,info", "logging.level.root=INFO",
               "spring.datasource.url=jdbc:postgresql://db.internal/catalog"],
    "lua": ["-- gameplay tuning, loaded by the server at map start", "return {", "  map_rotation = { \"harbor\", "
            "\"mines\", \"citadel\" },", "  friendly_fire = false,", "  score_limit_enabled = true,", "}"],
}
FILE_NAMES = {"cpp": ["engine/include/audio/ring_buffer.h", "engine/include/core/loop.h"],
              "cmake": ["engine/CMakeLists.txt"], "proto": ["proto/catalog/v1/search.proto"],
              "ansible": ["provision/site.yml"], "spring": ["catalog/src/main/resources/application.properties"],
              "lua": ["server/config/gameplay.lua"]}

FILLER_TURNS = [
    ("Why does my CMake build pick up the wrong compiler?", 80,
     "CMake caches the compiler on the first configure; changing `CC`/`CXX` later has no effect. Delete the build "
     "directory (or pass `-DCMAKE_CXX_COMPILER=...` to a fresh one) and configure again."),
    ("Is std::atomic<bool> enough for a stop flag between threads?", 70,
     "Yes: a store with release order in the signalling thread and a load with acquire order in the worker is "
     "enough for a flag; use a condition variable as well if the worker should sleep instead of polling."),
    ("How do I rename a protobuf field without breaking old clients?", 90,
     "Keep the field number and type; the name is not on the wire in the binary format. Mark the old name "
     "`reserved` only when you actually drop a field, and watch JSON mappings, which do use names."),
    ("What's the difference between an Ansible handler and a task?", 80,
     "A handler runs only when a task notifies it, and once at the end of the play no matter how many tasks "
     "notified it; that is why service restarts usually live in handlers."),
    ("Should I use HikariCP defaults in production?", 80,
     "Mostly: set the pool size from the database's connection limit divided by the number of instances, set a "
     "max lifetime a little below the database's idle timeout, and leave the rest alone until metrics say otherwise."),
    ("How do I profile a Lua script that runs inside the server?", 70,
     "Use a sampling hook (`debug.sethook` with a count) to record the current function every N instructions, or "
     "LuaJIT's built-in profiler if you run LuaJIT; both are cheap enough to leave on in a test match."),
    ("Which is better for game servers, UDP or TCP?", 90,
     "UDP for fast-paced state updates, where a late packet is worthless, with your own reliability for the few "
     "messages that need it; TCP is fine for turn-based games and for chat, login and shop traffic."),
    ("What does `git rebase --onto` do?", 70,
     "It replays a range of commits onto a new base: `git rebase --onto main feature-a feature-b` moves the commits "
     "of feature-b that are not in feature-a on top of main."),
]

PLATFORM = DayScript(
    fact_types=FACT_TYPES, frames=FRAMES, values=VALUES, filler_lines=FILLER, file_names=FILE_NAMES,
    filler_turns=FILLER_TURNS,
    asks=["So,", "Remind me:", "For the release notes:", "Wait,", ""],
    tails=["Only the value.", "Keep it short.", "Cheers.", ""],
    acks=["Got it.", "Read them, thanks.", "OK, noted.", "Right."],
    probe_replies=["Let me check what you sent.", "It should be in one of the files."],
    attach_texts=["A few files from the engine repo.", "Here is the platform config:", "More code for context."],
    salt=(6151, 23))


def make_session(seed: int, *, probes: int = 4) -> Session:
    """A session of the platform family (`make_day_session` with this module's script)."""
    return make_day_session(seed, PLATFORM, probes=probes)
