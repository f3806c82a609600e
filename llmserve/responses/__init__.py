"""The Responses API's stored responses: one deployment every Router and replica reads."""
