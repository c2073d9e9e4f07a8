"""The sanitizer: size and depth limits (`walk`), text cleaning (`text`), schema validation
(`schema`), secret and PII findings (`secrets`), JSON paths (`paths`); `stage` is the pipeline
stage that runs them on a call's arguments."""
