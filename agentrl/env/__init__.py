"""The env API: `TextEnv` (a `gymnasium.Env` of text actions and chat-message observations,
`base`), the registry (`registry`), content checks (`content`)."""
