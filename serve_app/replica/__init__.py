"""The model replica: the `ModelServer` deployment, its engine process (`engine_child`) and the pacing of
its messages, the hand-off of events to the event loop, and a request made ready for the engine. Uses
`serve_app.ops` (metrics, nodes) and the shared contract `serve_app.events`; never the OpenAI surface."""
