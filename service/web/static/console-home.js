// The console's home page: sign in and see what the key's role may do.
"use strict";
Console.init(() => {});
