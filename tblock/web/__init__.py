"""The demo page's files (index.html, demo.css, demo.js), served and exported by tblock.lesson.demo_server."""
