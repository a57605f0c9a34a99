"""Images and audio in: the media types the engine takes (`types`), transformers' own Gemma-4 processors loaded
from the checkpoint (`processor`), the host encoders (`encoders`) and `support.MediaSupport`, what the serve side
calls to turn a rendered prompt plus its media into prompt ids and `MediaInput`s."""
