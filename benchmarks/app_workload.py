"""A fifth retrieval workload, written before it was first run (2026-11-26, sixth pass) and run once on the defaults:
an app team's day, with file kinds no other family has (Kotlin and Gradle, Swift, an OpenAPI spec, a GraphQL schema,
Helm values, dbt SQL and YAML, a Tailwind config, CSS) and facts stated in chat.

Invariants: as the day family's (`day_workload.make_day_session`): a session is a pure function of its seed, every
fact value is unique in its session, a probe comes at least three turns after its fact, in other words.
"""

from __future__ import annotations

from .day_workload import DayScript, make_day_session
from .recall_workload import Session

FACT_TYPES = ("android", "ios", "api", "helm", "dbt", "style", "chat")

# type -> frames: (line with {v}, file kind, questions that avoid the line's words, value maker)
FRAMES: dict[str, list[tuple[str, str, list[str], str]]] = {
    "android": [
        ("    const val SYNC_INTERVAL_MINUTES = {v}L", "kotlin",
         ["How often does the phone app pull fresh data in the background?",
          "What is the period of the Android background refresh, in minutes?"], "small"),
        ("        minSdk = {v}", "gradle",
         ["What is the oldest Android API level the app still installs on?",
          "Which platform level is the lowest we support on phones?"], "api"),
    ],
    "ios": [
        ("    static let maxCachedImages = {v}", "swift",
         ["How many pictures does the iPhone app keep in memory at most?",
          "What is the upper limit on thumbnails held by the iOS client?"], "num"),
        ("        config.timeoutIntervalForRequest = {v}", "swift",
         ["How long does the iOS networking layer wait before a call fails?",
          "After how many seconds does the Apple client abandon a slow fetch?"], "small"),
    ],
    "api": [
        ("          maxLength: {v}", "openapi",
         ["How many characters may a user's visible name have, per the API spec?",
          "What is the longest nickname the REST contract allows?"], "small"),
        ("  orders(first: Int = {v}, after: String): OrderConnection!", "graphql",
         ["How many purchases come back from the orders query if no count is given?",
          "What page length does the GraphQL list of purchases use by default?"], "small"),
    ],
    "helm": [
        ("  maxReplicas: {v}", "helm",
         ["What is the most pods the autoscaler will ever run for the web tier?",
          "How far can Kubernetes scale the frontend out?"], "small"),
        ("  targetCPUUtilizationPercentage: {v}", "helm",
         ["At what processor load does the cluster add another copy of the app?",
          "Which usage level triggers scaling up in the chart?"], "pct"),
    ],
    "dbt": [
        ("      warn_after: {{count: {v}, period: hour}}", "dbtyml",
         ["After how many hours of staleness do we get a warning about the source tables?",
          "How old may the raw data get before the pipeline complains?"], "small"),
        ("{{{{ config(materialized='incremental', lookback_days={v}) }}}}", "dbtsql",
         ["How far into the past does the dbt model reprocess on every run?",
          "What window of recent history gets rebuilt each time the warehouse job runs?"], "small"),
    ],
    "style": [
        ("        md: '{v}px',", "tailwind",
         ["At what width does the site switch to the tablet layout?",
          "Which viewport size is our medium breakpoint?"], "px"),
        ("  --radius-card: {v}px;", "css",
         ["How rounded are the corners of our panels?",
          "What curvature do the tiles in the UI get?"], "small"),
    ],
    "chat": [
        ("reminder: App Store review for build {v} is still pending", "chat",
         ["Which iOS release number is Apple still checking?",
          "What build did we submit that hasn't been approved yet?"], "num"),
        ("FYI the design sync moved to {v} afternoons", "chat",
         ["When is the weekly meeting with the designers now?",
          "Which day do we meet the UX folks these days?"], "weekday"),
    ],
}

VALUES = {
    "num": lambda rng: str(rng.randint(140, 9600)),
    "small": lambda rng: str(rng.randint(3, 60)),
    "api": lambda rng: str(rng.randint(21, 34)),
    "pct": lambda rng: str(rng.randint(55, 95)),
    "px": lambda rng: str(rng.randint(61, 110) * 10),
    "weekday": lambda rng: rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")),
}

FILLER = {
    "kotlin": ["package com.shop.sync", "", "import androidx.work.Constraints", "import androidx.work.NetworkType",
               "", "object SyncConfig {", "    const val WORK_NAME = \"catalog-sync\"",
               "    val constraints = Constraints.Builder()", "        .setRequiredNetworkType(NetworkType.CONNECTED)",
               "        .build()", "}"],
    "gradle": ["plugins {", "    id(\"com.android.application\")", "    kotlin(\"android\")", "}", "", "android {",
               "    namespace = \"com.shop.app\"", "    defaultConfig {", "        applicationId = \"com.shop.app\"",
               "    }", "}"],
    "swift": ["import Foundation", "import UIKit", "", "final class APIClient {", "    let session: URLSession",
              "    init() {", "        let config = URLSessionConfiguration.default", "        session = URLSession("
              "configuration: config)", "    }", "}"],
    "openapi": ["openapi: 3.1.0", "info:", "  title: Shop API", "paths:", "  /users/{id}:", "    patch:",
                "      requestBody:", "components:", "  schemas:", "    UserUpdate:", "      properties:",
                "        displayName:", "          type: string"],
    "graphql": ["type Query {", "  me: User", "  product(id: ID!): Product", "}", "", "type OrderConnection {",
                "  edges: [OrderEdge!]!", "  pageInfo: PageInfo!", "}"],
    "helm": ["image:", "  repository: registry.example.com/shop-web", "  pullPolicy: IfNotPresent", "",
             "service:", "  type: ClusterIP", "", "autoscaling:", "  enabled: true"],
    "dbtyml": ["version: 2", "", "sources:", "  - name: shop_raw", "    loaded_at_field: _loaded_at",
               "    freshness:", "    tables:", "      - name: orders", "      - name: customers"],
    "dbtsql": ["select", "    o.order_id,", "    o.customer_id,", "    o.placed_at,", "    sum(i.amount) as total",
               "from {{ ref('stg_orders') }} o", "join {{ ref('stg_order_items') }} i using (order_id)",
               "group by 1, 2, 3"],
    "tailwind": ["/** @type {import('tailwindcss').Config} */", "module.exports = {",
                 "  content: ['./src/**/*.{ts,tsx}'],", "  theme: {", "    screens: {", "    },", "  },",
                 "  plugins: [],", "};"],
    "css": [":root {", "  --color-brand: #3b5bdb;", "  --font-body: 'Inter', sans-serif;",
            "  --shadow-card: 0 1px 2px rgb(0 0 0 / 0.1);", "}"],
}
FILE_NAMES = {"kotlin": ["android/app/src/main/java/com/shop/sync/SyncConfig.kt"],
              "gradle": ["android/app/build.gradle.kts"],
              "swift": ["ios/Shop/Networking/APIClient.swift", "ios/Shop/Images/ImageCache.swift"],
              "openapi": ["api/openapi.yaml"], "graphql": ["api/schema.graphql"], "helm": ["charts/web/values.yaml"],
              "dbtyml": ["warehouse/models/sources.yml"], "dbtsql": ["warehouse/models/fct_orders.sql"],
              "tailwind": ["web/tailwind.config.js"], "css": ["web/src/styles/tokens.css"]}

FILLER_TURNS = [
    ("Why does my Compose preview stop updating after I edit the composable?", 80,
     "The preview only refreshes after a successful build of that module; a compile error elsewhere, or a preview "
     "function with parameters that have no defaults, leaves the old render up. Use `@PreviewParameter` for inputs "
     "and rebuild with the refresh button when live edit is off."),
    ("How do I make a SwiftUI list load more rows when the user reaches the end?", 90,
     "Attach `.onAppear` to the last row (or to a small sentinel view after the rows) and start the next page "
     "request there; guard with an `isLoading` flag so fast scrolling does not fire it twice, and append the page "
     "to the array the `List` reads."),
    ("REST or GraphQL for a new public API?", 100,
     "REST is simpler to cache at the HTTP layer and easier for third parties to call with curl; GraphQL shines "
     "when many clients need different shapes of the same data. For a public API with few consumers, start with "
     "REST and a good OpenAPI spec."),
    ("How do I roll back a Helm release that broke the site?", 60,
     "`helm history web` lists the revisions; `helm rollback web <revision>` redeploys an earlier one. Add "
     "`--wait` so the command returns only when the pods are ready again."),
    ("What's the point of dbt's ref() instead of writing the table name?", 80,
     "`ref` builds the dependency graph, so models run in the right order, and it resolves to the schema of the "
     "environment you are running in; a hard-coded name would read production tables from your dev run."),
    ("How do I stop the page jumping when web fonts load?", 70,
     "Reserve the space: use `font-display: optional` or `swap` with a fallback font whose metrics are adjusted "
     "(`size-adjust`, `ascent-override`), and preload the main font file so it arrives early."),
    ("Coroutines or RxJava in a new Android app?", 90,
     "Coroutines with Flow: they are the platform's default now, integrate with lifecycle scopes and Room, and read "
     "like sequential code. RxJava is still fine in an existing codebase, but a new app gains little from it."),
    ("How do I find which commit broke the build?", 70,
     "`git bisect start`, mark the current commit bad and a known good one good, then let `git bisect run` call "
     "your test script; it halves the range each step and names the first bad commit."),
]

APP = DayScript(
    fact_types=FACT_TYPES, frames=FRAMES, values=VALUES, filler_lines=FILLER, file_names=FILE_NAMES,
    filler_turns=FILLER_TURNS,
    asks=["Hmm,", "Real quick:", "Need this for the PR:", "Can't find it:", ""],
    tails=["Just the value please.", "Short answer.", "Thanks.", ""],
    acks=["Cool, thanks.", "Alright, read them.", "OK.", "Sounds good."],
    probe_replies=["Let me look at the files again.", "I think it was in what you pasted."],
    attach_texts=["Dropping a few files from the app repo.", "Here's the config I mentioned:",
                  "Some more source for you."],
    salt=(4099, 17))


def make_session(seed: int, *, probes: int = 4) -> Session:
    """A session of the app family (`make_day_session` with this module's script)."""
    return make_day_session(seed, APP, probes=probes)
